"""Render the docs site without Quarto: every page as HTML, with working links between pages.

    python tools/preview_docs.py                 # writes _preview/ (git-ignored); open _preview/index.html
    python tools/preview_docs.py --out DIR       # somewhere else
    python tools/preview_docs.py --serve         # and serve it at http://127.0.0.1:8080 until Ctrl-C

It runs `nbdev-proc-nbs` on a copy of the project (as `nbdev-preview` does before Quarto renders), then renders each
processed notebook with nbconvert. Those who have Quarto get the real site with `nbdev-preview`.
"""
import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CELL_KEYS = {"cell_type", "id", "metadata", "source", "outputs", "execution_count", "attachments"}


def clean_cell(c: dict) -> dict:
    "A processed cell as nbformat accepts it: standard keys, no timing metadata, no execution counts on displays."
    keys = CELL_KEYS if c["cell_type"] == "code" else CELL_KEYS - {"outputs", "execution_count"}
    c = {k: v for k, v in c.items() if k in keys} | {"metadata": {}}
    for o in c.get("outputs", []):
        if o.get("output_type") != "execute_result": o.pop("execution_count", None)
    return c


def process(work: Path) -> list[Path]:
    "Copy the notebooks and library into `work`, run `nbdev-proc-nbs` there; the processed notebooks."
    for name in ("nbs", "openenv_nb"):
        shutil.copytree(ROOT / name, work / name, ignore=shutil.ignore_patterns("_proc", "__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", work / "pyproject.toml")
    r = subprocess.run(["nbdev-proc-nbs"], cwd=work, capture_output=True, text=True, timeout=600)
    if r.returncode: raise RuntimeError(f"nbdev-proc-nbs failed:\n{r.stdout[-3000:]}{r.stderr[-3000:]}")
    return sorted(p for p in (work / "_proc").rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)


def to_html(nbs: list[Path], proc: Path, out: Path, scratch: Path) -> list[Path]:
    "Render the processed notebooks `nbs` (under `proc`) to their pages under `out`; links to notebooks go to pages."
    by_dir: dict[Path, list[Path]] = {}
    for nb in nbs:
        rel = nb.relative_to(proc)
        clean = scratch / rel  # nbdev's processor leaves keys (e.g. `has_sd`) that nbformat refuses
        clean.parent.mkdir(parents=True, exist_ok=True)
        d = json.loads(nb.read_text())
        d["cells"] = [clean_cell(c) for c in d["cells"] if c["cell_type"] != "raw"]  # raw cells: Quarto's front matter
        clean.write_text(json.dumps(d))
        by_dir.setdefault(rel.parent, []).append(clean)
    for folder, cleans in by_dir.items():  # one nbconvert per folder: its start-up is most of the time
        dest = out / folder
        dest.mkdir(parents=True, exist_ok=True)
        r = subprocess.run([sys.executable, "-m", "nbconvert", "--to", "html", "--output-dir", str(dest),
                            *map(str, cleans)], capture_output=True, text=True, timeout=600)
        if r.returncode: raise RuntimeError(f"{folder}: {r.stderr[-2000:]}")
    pages = [out / nb.relative_to(proc).with_suffix(".html") for nb in nbs]
    for html in pages: html.write_text(re.sub(r'href="([^"#:]+)\.ipynb(#[^"]*)?"', r'href="\1.html\2"', html.read_text()))
    return pages


def build(out: Path, work: Path | None = None) -> dict:
    "The site under `out`: `{'proc', 'pages', 'nbs', 'out'}` (`work`: where the copy is processed; a temp folder)."
    work = Path(work or tempfile.mkdtemp(prefix="openenv-docs-"))
    pages = process(work)
    shutil.rmtree(out, ignore_errors=True)
    to_html(pages, work / "_proc", out, work / "clean")
    return {"proc": work / "_proc", "pages": pages, "nbs": work / "nbs", "out": out}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "_preview", help="where the pages go (default: _preview)")
    ap.add_argument("--serve", action="store_true", help="then serve them on http://127.0.0.1:8080")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="openenv-docs-") as work:
        site = build(a.out, Path(work))
    print(f"{len(site['pages'])} pages: open {a.out / 'index.html'}")
    if a.serve: subprocess.run([sys.executable, "-m", "http.server", "8080", "-b", "127.0.0.1", "-d", str(a.out)])


if __name__ == "__main__": main()
