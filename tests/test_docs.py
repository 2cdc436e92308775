"""The docs site, checked without Quarto: every notebook processes, renders to HTML, and the pages hold together."""
import json
import re
import sys
from pathlib import Path

import pytest

from conftest import need_browser, CHROMIUM

sys.path.insert(0, str(Path(__file__).parent.parent / "tools"))
import preview_docs  # noqa: E402

ROOT = Path(__file__).parent.parent
NBS = ROOT / "nbs"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site as `tools/preview_docs.py` renders it without Quarto: `nbdev-proc-nbs` on a copy, then nbconvert."""
    return preview_docs.build(tmp_path_factory.mktemp("preview"), tmp_path_factory.mktemp("docs"))


def test_every_notebook_processes_and_renders(site):
    nbs = site["nbs"]  # the copy that was processed, so a notebook added meanwhile does not count
    sources = sorted(p.relative_to(nbs) for p in nbs.rglob("*.ipynb") if not any(s.startswith((".", "_")) for s in p.relative_to(nbs).parts))
    assert sorted(p.relative_to(site["proc"]) for p in site["pages"]) == sources
    assert all((site["out"] / p.with_suffix(".html")).exists() for p in sources)


def test_no_error_outputs(site):
    bad = []
    for nb in site["pages"]:
        for c in json.loads(nb.read_text())["cells"]:
            bad += [f"{nb.name}: {o.get('ename')}: {o.get('evalue')}" for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not bad, bad


def test_api_pages_document_every_public_function_and_class(site):
    import importlib, inspect
    for nb in site["pages"]:
        src = json.loads((site["nbs"] / nb.relative_to(site["proc"])).read_text())["cells"]
        exp = next((("".join(c["source"])).split()[-1] for c in src if "".join(c["source"]).startswith("#| default_exp")), None)
        if exp is None: continue
        mod, text = importlib.import_module(f"openenv_nb.{exp}"), nb.read_text()
        public = [n for n in getattr(mod, "__all__", []) if (inspect.isclass(o := getattr(mod, n)) or inspect.isfunction(o))
                  and o.__module__ == mod.__name__]  # what a package's front page re-exports is documented where it lives
        missing = [n for n in public if f"show_doc({n})" not in text]
        assert not missing, (exp, missing)


def test_pages_in_a_browser(site):
    sync_playwright = need_browser()
    out = site["out"]
    broken = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking"])
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        for html in sorted(out.rglob("*.html")):
            page.goto(html.as_uri())
            assert page.title() or page.locator("h1").count(), html
            for href in page.eval_on_selector_all("a[href]", "els => els.map(e => e.getAttribute('href'))"):
                if re.match(r"^[a-z]+:|^#|^$", href): continue  # external, anchor, or empty
                target = (html.parent / href.split("#")[0]).resolve()
                if not target.exists(): broken.append(f"{html.relative_to(out)} -> {href}")
        page.goto((out / "index.html").as_uri())
        page.screenshot(path=str(out / "index.png"), full_page=True)
        browser.close()
    assert not broken, broken


def test_sidebar_lists_every_page():
    "Every notebook is a page of the site's sidebar, and every sidebar entry is a notebook."
    import yaml
    def entries(items):
        for it in items:
            if isinstance(it, str): yield it
            elif isinstance(it, dict): yield from entries(it.get("contents", []))
    listed = set(entries(yaml.safe_load((NBS / "sidebar.yml").read_text())["website"]["sidebar"]["contents"]))
    pages = {str(p.relative_to(NBS)) for p in NBS.rglob("*.ipynb") if not any(s.startswith((".", "_")) for s in p.relative_to(NBS).parts)}
    assert (sorted(pages - listed), sorted(listed - pages)) == ([], [])


@pytest.fixture(scope="module")
def module_map():
    """What the module map page computes when the docs are built: its `#| exec_doc` cells, run as a script.
    `problems(GRAPH)` holds the rule breaks by kind, from the imports in openenv_nb/*.py."""
    ns = {}
    for c in json.loads((NBS / "module_map.ipynb").read_text())["cells"]:
        src = "".join(c["source"])
        if c["cell_type"] == "code" and src.startswith("#| exec_doc"): exec(compile(src, "module_map.ipynb", "exec"), ns)
    return ns["problems"](ns["GRAPH"])


def test_module_map_no_import_cycles(module_map):
    assert not module_map["cycles"], module_map["cycles"]


def test_module_map_nothing_imports_cli(module_map):
    assert not module_map["imports of cli"], module_map["imports of cli"]


def test_module_map_arrows_point_down_the_layers(module_map):
    assert not module_map["arrows up the table"], module_map["arrows up the table"]


def test_module_map_layer_table_covers_every_module(module_map):
    assert not module_map["not in the table"], module_map["not in the table"]


def test_module_map_parts_of_a_package_point_down(module_map):
    assert not module_map["arrows up a package's parts"], module_map["arrows up a package's parts"]
    assert not module_map["parts not listed"], module_map["parts not listed"]
