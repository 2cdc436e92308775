"""Put openenv-nb's server in place of upstream `openenv` 0.10's, in every Python process of the upstream venv.

`tests/test_upstream_suite.py` runs upstream's own test files with this folder on `PYTHONPATH`; Python imports
`sitecustomize` at start-up, so the swap also reaches the servers those tests start in subprocesses (`python -m uvicorn
envs.echo_env.server.app:app`). It acts only when `OPENENV_SHIM=ours`; otherwise upstream's server stays (the reference run).

What it swaps: `create_app`, `create_fastapi_app` and `HTTPEnvServer` of `openenv.core.env_server.http_server` (and their
re-exports in `openenv.core.env_server`). The replacements take upstream's arguments and build `openenv_nb.server.create_app`,
serving the same upstream environment, action and observation classes. Two translations are needed, and are all this file does:
- upstream's `ConcurrencyConfig` becomes `max_concurrent_envs` / `session_timeout`; `ENABLE_WEB_INTERFACE` picks `web`
  (`create_fastapi_app` never serves the page, as upstream's);
- an upstream `MCPEnvironment` (built on `fastmcp`) is served as one of ours made from its own `FastMCP` server
  (`UpstreamTools`): our server then lists and calls its tools with its own MCP code, while `reset`, `state` and
  non-tool actions go to the upstream environment itself;
- a plain upstream environment served with upstream's tool actions (`CallToolAction`, upstream's "MCP-style step") is
  served with ours (`UpstreamToolSteps`): each action is copied into upstream's class on the way in, and each tool
  observation into ours on the way out.
"""
import os

if os.environ.get("OPENENV_SHIM") == "ours":
    import functools

    import openenv.core.env_server as _pkg
    import openenv.core.env_server.http_server as _hs
    from openenv.core.env_server import mcp_types as _up_types
    from openenv.core.env_server.mcp_environment import MCPEnvironment as _UpMCP
    from openenv.core.env_server.types import State as _UpState

    from openenv_nb import server as _ours
    from openenv_nb import mcp as _our_types
    from openenv_nb.actions import accepted as _accepted, call_env as _call_env
    from openenv_nb.environment import Environment as _OurEnv
    from openenv_nb.mcp import MCPEnvironment as _OurMCP

    class Around:
        "What our environments around an upstream one share: it is made by the factory `_served` sets, and keeps the episode."
        _factory = None  # the upstream factory, set on each subclass by `_served`

        def reset(self, seed=None, episode_id=None, **kwargs):
            kw = {"seed": seed, "episode_id": episode_id, **kwargs}
            return self.inner.reset(**_accepted(self.inner.reset, {k: v for k, v in kw.items() if v is not None}))

        @property
        def state(self):
            return self.inner.state

        def get_metadata(self):
            return self.inner.get_metadata()

        def close(self):
            self.inner.close()

    class UpstreamTools(Around, _OurMCP):
        "One of our tool environments around an upstream `MCPEnvironment`: its `FastMCP` tools, its reset, state and actions."
        def __init__(self):
            self.inner = type(self)._factory()
            super().__init__(mcp_server=self.inner.mcp_server)

        def _step_impl(self, action, timeout_s=None, **kwargs):
            return self.inner.step(action, **_accepted(self.inner.step, {"timeout_s": timeout_s, **kwargs}))

    _TOOL_CLASSES = ("CallToolAction", "ListToolsAction", "CallToolObservation", "ListToolsObservation")
    _TO_UPSTREAM = {getattr(_our_types, n): getattr(_up_types, n) for n in _TOOL_CLASSES}
    _TO_OURS = {getattr(_up_types, n): getattr(_our_types, n) for n in _TOOL_CLASSES}

    class UpstreamToolSteps(Around, _OurEnv):
        "A plain upstream environment that takes upstream's tool actions, served with ours: copied to upstream's on the way in, back on the way out."
        def __init__(self):
            self.inner = type(self)._factory()

        def step(self, action, **kwargs):
            raise NotImplementedError("served through step_async")

        async def step_async(self, action, timeout_s=None, **kwargs):
            up = _TO_UPSTREAM.get(type(action))
            obs = await _call_env(self.inner, "step", None, up.model_validate(action.model_dump()) if up else action, timeout_s=timeout_s, **kwargs)
            ours = _TO_OURS.get(type(obs))
            return ours.model_validate(obs.model_dump()) if ours else obs

    def _upstream_class(env):
        "The class an upstream factory builds, without building one: the class itself, or a factory's return annotation."
        if isinstance(env, type): return env
        target = env.func if isinstance(env, functools.partial) else env
        return getattr(target, "__annotations__", {}).get("return")

    def _served(env, action_cls):
        "What our `create_app` serves for the upstream factory `env`: `env` itself, or a class of ours around it for tools."
        cls = _upstream_class(env)
        if action_cls in _TO_OURS and callable(env) and not (isinstance(cls, type) and issubclass(cls, _UpMCP)):
            return type(f"Upstream{getattr(cls, '__name__', 'Env')}", (UpstreamToolSteps,), {
                "_factory": staticmethod(env), "SUPPORTS_CONCURRENT_SESSIONS": getattr(cls, "SUPPORTS_CONCURRENT_SESSIONS", False)})
        if not (isinstance(cls, type) and issubclass(cls, _UpMCP)): return env
        return type(f"Upstream{cls.__name__}", (UpstreamTools,), {
            "_factory": staticmethod(env), "SUPPORTS_CONCURRENT_SESSIONS": getattr(cls, "SUPPORTS_CONCURRENT_SESSIONS", False)})

    def _limits(max_concurrent_envs, concurrency_config) -> dict:
        if max_concurrent_envs is not None and concurrency_config is not None:
            raise ValueError("Cannot specify both 'max_concurrent_envs' and 'concurrency_config'.")
        if concurrency_config is None: return {"max_concurrent_envs": max_concurrent_envs}
        return {"max_concurrent_envs": concurrency_config.max_concurrent_envs, "session_timeout": concurrency_config.session_timeout}

    def _build(env, action_cls, observation_cls, *, max_concurrent_envs=None, concurrency_config=None, env_name=None,
               state_cls=_UpState, mode=None, reset_observation_cls=None, web=False):
        return _ours.create_app(_served(env, action_cls), _TO_OURS.get(action_cls, action_cls), _TO_OURS.get(observation_cls, observation_cls), env_name=env_name, web=web, mode=mode,
                                state_cls=state_cls, reset_observation_cls=reset_observation_cls,
                                **_limits(max_concurrent_envs, concurrency_config))

    def create_app(env, action_cls, observation_cls, env_name=None, max_concurrent_envs=None, concurrency_config=None,
                   gradio_builder=None, custom_tab_name="Custom", custom_tab_primary=False, show_default_tab=True,
                   title_override=None, state_cls=_UpState, *, mode=None, reset_observation_cls=None):
        "Upstream's `create_app`, answered by ours (the page when `ENABLE_WEB_INTERFACE` says so; upstream's Gradio options unused)."
        web = os.getenv("ENABLE_WEB_INTERFACE", "false").lower() in ("true", "1", "yes")
        return _build(env, action_cls, observation_cls, max_concurrent_envs=max_concurrent_envs, concurrency_config=concurrency_config,
                      env_name=env_name, state_cls=state_cls, mode=mode, reset_observation_cls=reset_observation_cls, web=web)

    def create_fastapi_app(env, action_cls, observation_cls, max_concurrent_envs=None, concurrency_config=None, env_name=None,
                           state_cls=_UpState, *, mode=None, reset_observation_cls=None):
        "Upstream's `create_fastapi_app` (no web page), answered by ours."
        return _build(env, action_cls, observation_cls, max_concurrent_envs=max_concurrent_envs, concurrency_config=concurrency_config,
                      env_name=env_name, state_cls=state_cls, mode=mode, reset_observation_cls=reset_observation_cls)

    class HTTPEnvServer:
        "Upstream's `HTTPEnvServer`: `register_routes(app, mode)` mounts our app, built from the same arguments, on `app`."
        def __init__(self, env, action_cls, observation_cls, max_concurrent_envs=None, concurrency_config=None, env_name=None,
                     state_cls=_UpState, *, reset_observation_cls=None):
            self._args = (env, action_cls, observation_cls)
            self._kw = dict(max_concurrent_envs=max_concurrent_envs, concurrency_config=concurrency_config, env_name=env_name,
                            state_cls=state_cls, reset_observation_cls=reset_observation_cls)
            self.action_cls, self.observation_cls, self.state_cls, self.env_name = action_cls, observation_cls, state_cls, env_name
            self.reset_observation_cls = reset_observation_cls or observation_cls

        def register_routes(self, app, mode=None):
            app.mount("/", _build(*self._args, mode=mode, **self._kw))

    for _mod in (_hs, _pkg):
        _mod.create_app, _mod.create_fastapi_app, _mod.HTTPEnvServer = create_app, create_fastapi_app, HTTPEnvServer
