"""Real text for the dataprep stage tests, read from this machine at test time: translated manual
pages under /usr/share/man/<LANG> (roff crudely removed, see neardup_eval) and package docs.
Manual pages are free software documentation (GPL, BSD and similar licences); nothing is copied
into the repository."""
from __future__ import annotations

import random
import re
from pathlib import Path

from mspretrain.dataprep.steps.clean import normalize
from neardup_eval import _read

MAN = Path("/usr/share/man")


def man_languages() -> list[str]:
    """The translated manual page directories on this machine: 'de', 'zh_CN', ..."""
    return sorted(p.name for p in MAN.iterdir() if p.is_dir() and not p.name.startswith("man"))


def _english_lines(path: Path) -> set[str]:
    """The lines of the English page of the same name and section, if there is one."""
    section = path.parent.name
    try:
        return set(normalize(_read(MAN / section / path.name)).split("\n"))
    except (OSError, UnicodeDecodeError, EOFError):
        return set()


def man_texts(lang: str, n: int, min_chars: int = 600, max_chars: int = 4000,
              seed: int = 0, translated: float = 1.0) -> list[tuple[str, str]]:
    """Up to n (path, normalised text) of manual pages in `lang` ('en': the untranslated ones),
    each its DESCRIPTION-onward prose cut to max_chars, chosen by `seed`. Many translations leave
    paragraphs in English: with `translated` < 1, a page is taken only when at most
    1 - `translated` of its characters are in lines that its English original also has."""
    root = MAN if lang == "en" else MAN / lang
    paths = sorted((root / "man1").glob("*.gz")) if lang == "en" else sorted(root.rglob("*.gz"))
    random.Random(seed).shuffle(paths)
    out = []
    for p in paths:
        if len(out) >= n:
            break
        try:
            text = normalize(_read(p))
        except (UnicodeDecodeError, OSError, EOFError):
            continue
        # skip the NAME/SYNOPSIS head: option lists say little about the language
        m = re.search(r"\n(?:DESCRIPTION|BESCHREIBUNG|DESCRIPCIÓN|描述|説明|ОПИСАНИЕ)[^\n]*\n", text)
        body = text[m.end():] if m else text
        body = body[:max_chars]
        if len(body) < min_chars:
            continue
        if translated < 1.0 and lang != "en":
            english = _english_lines(p)
            same = sum(len(line) for line in body.split("\n") if line in english)
            if same > (1.0 - translated) * len(body):
                continue
        out.append((str(p), body))
    return out


# ------------------------------------------------------------------ a corpus with planted content

LANGS = ("de", "fr", "ru", "ja", "es", "pl", "uk", "nl", "sv", "ko")
PII = {   # planted exact strings -> the placeholder that must replace them
    "li.lei@example-mail.cn": "<EMAIL>", "ops+alerts@corp.example.org": "<EMAIL>",
    "203.0.113.77": "<IP>", "2001:db8:85a3::8a2e:370:7334": "<IP>",
    "13912345678": "<PHONE>", "+86 139 8765 4321": "<PHONE>", "+44 20 7946 0958": "<PHONE>",
    "11010519491231002X": "<ID_NUMBER>", "4111 1111 1111 1111": "<CARD>",
    "6222020200112233445": "<CARD>",
}
SURVIVORS = ["2.10.0", "1.2.3.4-rc1", "2024-01-15", "da39a3ee5e6b4b0d3255bfef95601890afd80709",
             "1234567890123", "12:30:45", "12345678"]


def _luhn_fix(digits: str) -> str:
    """`digits` with its last digit replaced by the Luhn check digit."""
    from mspretrain.dataprep.steps.pii import luhn_valid
    for d in "0123456789":
        if luhn_valid(digits[:-1] + d):
            return digits[:-1] + d
    raise AssertionError


PII["6222020200112233445"] = PII.pop("6222020200112233445")
CARD_UNIONPAY = _luhn_fix("6222020200112233445")
PII[CARD_UNIONPAY] = PII.pop("6222020200112233445")


def eval_passages(n: int = 6) -> list[str]:
    """Real English and Chinese passages (about 400 characters) that play a benchmark's part."""
    en = [t for _, t in man_texts("en", n, seed=11)]
    zh = [t for _, t in man_texts("zh_TW", n // 2 + 1, min_chars=300, seed=3)]
    picked = en[: n - n // 2] + zh[: n // 2]
    return [t[100:500] for t in picked]


def write_corpus(root: Path, per_lang: int = 4) -> dict:
    """jsonl files of real documents: English and Chinese pages, other languages, the PII and
    the evaluation passages planted into some English and Chinese ones. Returns what was planted."""
    import json
    root.mkdir(parents=True, exist_ok=True)
    en = man_texts("en", 24, seed=5)
    zh = man_texts("zh_CN", 6, translated=0.8, seed=1) + man_texts("zh_TW", 5, seed=1)
    others = [(lang, t) for lang in LANGS for _, t in man_texts(lang, per_lang, translated=0.8)]
    passages = eval_passages()
    pii_strings = list(PII)
    docs = []
    for i, (_, text) in enumerate(en + zh):
        lines = text.split("\n")
        if i < len(pii_strings):      # one planted string each, with a survivor next to it
            k = len(lines) // 2
            lines.insert(k, f"Contact {pii_strings[i]} for help (tested with {SURVIVORS[i % len(SURVIVORS)]}).")
        if 12 <= i < 12 + len(passages):
            lines.insert(len(lines) // 3, passages[i - 12])
        docs.append({"id": f"en-zh-{i}", "text": "\n".join(lines)})
    for i, (lang, text) in enumerate(others):
        docs.append({"id": f"{lang}-{i}", "text": text})
    (root / "docs.jsonl").write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs))
    return {"pii": dict(PII), "passages": passages, "others": len(others),
            "en_zh": len(en) + len(zh)}


def decoded_samples(out: Path) -> str:
    """The token stream of every split of a built dataset (its samples in order, which is the
    stream: samples do not overlap), decoded one document (EOS to EOS) a line."""
    import sentencepiece as spm
    from mindspore.mindrecord import FileReader
    from mspretrain.loader.manifest import load_manifest
    m = load_manifest(out)
    sp = spm.SentencePieceProcessor(model_file=str(out / "tokenizer.model"))
    docs = []
    for split in m.splits.values():
        stream: list[int] = []
        for shard in split.shards:
            reader = FileReader(str(out / shard.file))
            rows = sorted((int(r["sample_id"]), r["input_ids"].tolist()) for r in reader.get_next())
            reader.close()
            for _, ids in rows:
                stream += ids
        doc: list[int] = []
        for t in stream:
            if t == sp.eos_id():
                docs.append(sp.decode(doc))
                doc = []
            else:
                doc.append(t)
        docs.append(sp.decode(doc))
    return "\n".join(docs)
