"""Write README.md from nbs/index.ipynb: markdown cells as they are, code cells as Python blocks.

    python tools/make_readme.py          # write README.md
    python tools/make_readme.py --check  # exit 1 if README.md differs from what index.ipynb gives
"""
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def render(nb_path: Path = ROOT / "nbs" / "index.ipynb") -> str:
    """The README text for the notebook at `nb_path`."""
    parts = []
    for c in json.loads(nb_path.read_text())["cells"]:
        src = "".join(c["source"]).strip("\n")
        if not src or src.startswith("#| hide"): continue
        parts.append(src if c["cell_type"] == "markdown" else f"```python\n{src}\n```")
    return "\n\n".join(parts) + "\n"


if __name__ == "__main__":
    text, readme = render(), ROOT / "README.md"
    if "--check" in sys.argv: sys.exit(0 if readme.read_text() == text else "README.md is out of date: run python tools/make_readme.py")
    readme.write_text(text)
