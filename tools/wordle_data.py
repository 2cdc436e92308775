"""Writes `openenv_nb/envs/data/wordle.json.gz`: what TextArena's Wordle reads from NLTK, so it plays with no download.

TextArena's Wordle draws its secret from NLTK's `words` corpus (`en-basic`, or `en` when hardcore), keeping the words
of the game's length that NLTK's tagger (`averaged_perceptron_tagger_eng`) tags `NN`, and accepts a guess found in
its Hunspell dictionaries or in NLTK's `en` words. This runs that once, for the lengths TextArena registers (5 and
7), and stores the result. It needs NLTK's `words` and `averaged_perceptron_tagger_eng` installed here
(`python -m nltk.downloader words averaged_perceptron_tagger_eng`); nothing at run time does.

    python tools/wordle_data.py
"""
import gzip
import json
from pathlib import Path

import nltk
from nltk.corpus import words

LENGTHS = (5, 7)  # Wordle-v0 (-hardcore) and Wordle-v0-long (-hardcore)
OUT = Path(__file__).resolve().parents[1] / "openenv_nb" / "envs" / "data" / "wordle.json.gz"


def nouns(corpus: str, n: int) -> list[str]:
    "As TextArena's `WordleEnv._load_word_list`: the `n`-letter words of `corpus` that the tagger tags `NN`, in order."
    return [w for w in words.words(corpus) if len(w) == n and nltk.pos_tag([w])[0][1] == "NN"]


def english(n: int) -> list[str]:
    "As TextArena's `EnglishDictionary(include_nltk=True).nltk_words`, the `n`-letter ones: lower-case, alphabetic first."
    return sorted({w for w in words.words("en") if len(w) == n and w[0].isalpha() and w[0].islower()})


def main():
    data = {"about": "NLTK's words corpus and averaged_perceptron_tagger_eng, as TextArena's Wordle reads them "
                     "(tools/wordle_data.py)", "nltk": nltk.__version__,
            "nouns": {c: {str(n): nouns(c, n) for n in LENGTHS} for c in ("en-basic", "en")},
            "english": {str(n): english(n) for n in LENGTHS}}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_bytes(gzip.compress(json.dumps(data, separators=(",", ":")).encode(), mtime=0))
    print(OUT, OUT.stat().st_size, {c: {n: len(v) for n, v in d.items()} for c, d in data["nouns"].items()})


if __name__ == "__main__": main()
