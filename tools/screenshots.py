"""Screenshots of each environment's web page, for the catalog (nbs/catalog.ipynb).

Each environment is served in this process (`create_app(..., web=True)` through `make_app`, on `serve_in_thread`),
its page at /web is opened in Chromium (/usr/bin/chromium, or $OPENENV_CHROMIUM; never a downloaded browser), one
short episode is played with the page's own form, and the page is saved as a PNG.

    python tools/screenshots.py                  # every environment, into nbs/images/catalog/
    python tools/screenshots.py chess echo       # some of them
    python tools/screenshots.py --out /tmp/shots # elsewhere
"""
import argparse
import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "nbs" / "images" / "catalog"
CHROMIUM = os.environ.get("OPENENV_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--no-first-run", "--disable-sync"]
MAX_BYTES = 150_000  # a committed screenshot stays under this
WORDS = ["crane", "slate", "pious", "lemon", "robin", "grape", "flint", "mirth"]  # Wordle's words: no NLTK data needed

# name -> (the target `openenv serve` takes, the steps: each a {field: text typed into the page's form})
SHOTS = {
    "echo": ("echo", [{"message": "hello"}, {"message": "hello, world"}]),
    "coding": ("coding", [{"code": "x = 6 * 7\nprint(f'the answer is {x}')"}, {"code": "print(x ** 2)"}]),
    "gym": ("gym:CartPole-v1", [{"action": "1"}, {"action": "0"}, {"action": "1"}]),
    "openspiel": ("openspiel:tic_tac_toe", [{"action_id": "4"}, {"action_id": "0"}]),
    "textarena": ("textarena:Wordle-v0?words=" + "[" + ",".join(f'"{w}"' for w in WORDS) + "]",
                  [{"message": "[crane]"}, {"message": "[pious]"}]),
    "chess": ("chess", [{"move": "e4"}, {"move": "Nf3"}]),
    "connect4": ("connect4", [{"column": "3"}, {"column": "4"}, {"column": "3"}]),
    "reasoning_gym": ("reasoning_gym:leg_counting", [{"answer": "292"}]),
}


def small_png(path: Path, data: bytes) -> Path:
    "Write the PNG `data` to `path`, as a 256-colour palette image when Pillow is here (a page has few colours)."
    try: from PIL import Image
    except ImportError: path.write_bytes(data); return path
    import io
    Image.open(io.BytesIO(data)).convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)
    return path


def fill(page, prefix: str, name: str, text: str):
    "Type `text` into the page's form field `name` (`prefix` is `field-` or `reset-`); a list's option by its label."
    box = page.locator(f"#{prefix}{name}")
    if box.evaluate("e => e.tagName") == "SELECT": box.select_option(label=text)
    else: box.fill(text)


def play(page, steps: list[dict], seed: int = 0):
    "Reset with `seed` and play `steps` through the page's form, waiting for each reply to show in the history."
    from playwright.sync_api import expect
    page.locator("#reset-options").evaluate("e => e.open = true")
    fill(page, "reset-", "seed", str(seed))
    fill(page, "reset-", "episode_id", "catalog")
    page.locator("#reset-options").evaluate("e => e.open = false")
    page.click("#reset")
    rows = page.locator("#history tbody tr")
    expect(rows).to_have_count(1)
    for n, step in enumerate(steps, start=2):
        for name, text in step.items(): fill(page, "field-", name, text)
        page.click("#step")
        expect(rows).to_have_count(n)


def shoot(browser, name: str, out: Path = OUT) -> Path:
    "Serve environment `name` of `SHOTS`, play its steps on its page, and save the page as `out/NAME.png`."
    from playwright.sync_api import expect
    from openenv_nb.server import serve_in_thread
    from openenv_nb.targets import make_app
    target, steps = SHOTS[name]
    with serve_in_thread(make_app(target, web=True)) as url:
        ctx = browser.new_context(viewport={"width": 1280, "height": 860}, color_scheme="light")
        errors = []
        try:
            page = ctx.new_page()
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(url + "/web")
            expect(page.locator("#status")).to_have_text("live")
            play(page, steps)
            page.mouse.move(0, 0)  # no hover effects in the picture
            page.locator("#observation pre").evaluate_all("es => es.forEach(e => e.scrollTop = e.scrollHeight)")  # the latest text
            data = page.screenshot(full_page=True, animations="disabled")
        finally: ctx.close()
    if errors: raise RuntimeError(f"{name}: the page's script failed: {errors}")
    out.mkdir(parents=True, exist_ok=True)
    return small_png(out / f"{name}.png", data)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("names", nargs="*", help=f"environments to shoot (default: all of {', '.join(SHOTS)})")
    p.add_argument("--out", type=Path, default=OUT, help="folder for the PNGs (default: nbs/images/catalog)")
    a = p.parse_args(argv)
    unknown = [n for n in a.names if n not in SHOTS]
    if unknown: p.error(f"unknown environment(s) {', '.join(unknown)}: choose from {', '.join(SHOTS)}")
    if not os.path.exists(CHROMIUM): sys.exit(f"no Chromium at {CHROMIUM}: apt-get install chromium, or set OPENENV_CHROMIUM")
    from playwright.sync_api import sync_playwright
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            for name in a.names or SHOTS:
                path = shoot(browser, name, a.out)
                size = path.stat().st_size
                print(f"{path}: {size / 1000:.0f} kB" + ("  (over the limit!)" if size > MAX_BYTES else ""))
        finally: browser.close()


if __name__ == "__main__":
    main()
