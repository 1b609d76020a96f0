"""The Hugging Face tokenizer files of an export: a `tokenizer.json` (the fast tokenizer every
transformers-based tool loads by default) that gives the ids sentencepiece gives, beside the
sentencepiece model itself for the slow `LlamaTokenizer`.

Why not let transformers convert the sentencepiece model on load: its Llama converter takes the dummy
prefix from `add_prefix_space` (absent: no prefix, so "The" becomes `T h e`), keeps control and byte
pieces in the vocabulary where text can reach them ("<s>" or "<0x41>" in a document become those ids),
and splits text at added tokens before adding the prefix. This module builds the tokenizer from the
model's own spec with the `tokenizers` library, reproducing sentencepiece step by step:

- normalizer: the model's precompiled character map (none for `identity`, what `dataprep build`
  trains with), the extra-whitespace removal when the model has it, then sentencepiece's dummy prefix
  (one "▁" before the whole text, also before a leading space) and every " " as "▁". Nothing splits the
  text before the normalizer (no added token is matched in text), so the prefix is added once;
- model, unigram: the pieces with their scores, the Viterbi search sentencepiece runs. sentencepiece
  never matches control, unknown, byte or unused pieces in text; here they get a score so low that no
  best path takes them (a path through such a piece scores worse than spelling it with single-character
  pieces), and a character that such a piece contains but that has no piece of its own is cut out of
  the text by the pre-tokenizer, so the low piece cannot be matched around it either. A user-defined
  piece scores as in sentencepiece's encoder (UTF-8 length x the best normal score - 0.1);
- model, BPE: merges ordered by the score of the piece they make (sentencepiece merges the
  best-scoring pair first), built from normal pieces only;
- byte fallback as the model has it. The special tokens (control and unknown pieces) are not added
  tokens of tokenizer.json, which would match "<s>" typed in a document (tokenizer.json cannot say
  otherwise); tokenizer_config.json names them, with `split_special_tokens` on, so transformers knows
  them (skip_special_tokens, bos_token_id) and still reads "<s>" in text as text, as training did;
- decoder: "▁" to " ", byte pieces to bytes, the dummy prefix taken off the start.

One residual for unigram models, which no tokenizer.json removes (docs/export.md, "The unigram
residual"): sentencepiece adds path scores in float32, tokenizers exactly in float64, so where float32
rounding decides between paths (runs of one character, whose pieces tie in several orders) the same
pieces come out in another order; sentencepiece's choice there depends on the score of the text before,
which no normalizer, pre-tokenizer or score table can see. About 2% of demo-corpus lines.

`check(model_file)` lists what could make the fast tokenizer differ from sentencepiece for a model
(never for one `dataprep build` trained); export prints it.
"""
from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

SPACE = "\u2581"
FLT_MIN = struct.unpack("f", struct.pack("I", 0x00800000))[0]   # sentencepiece's max_score_ start value
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6   # ModelProto.SentencePiece.Type


def load_proto(model_file: Path):
    from sentencepiece import sentencepiece_model_pb2 as pb
    proto = pb.ModelProto()
    proto.ParseFromString(Path(model_file).read_bytes())
    return proto


def _f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


class _Pieces:
    """The model's pieces sorted into what text can reach (normal, user-defined) and what it cannot."""

    def __init__(self, proto):
        self.pieces = [(p.piece, p.score, p.type) for p in proto.pieces]
        self.reachable = [p for p, _, t in self.pieces if t in (NORMAL, USER_DEFINED)]
        self.low = [p for p, _, t in self.pieces if t not in (NORMAL, USER_DEFINED)]
        # characters that are a piece of their own (what sentencepiece's lattice calls a single node)
        self.single = {p for p in self.reachable if len(p) == 1}
        normal = [s for _, s, t in self.pieces if t == NORMAL]
        self.min_score = min(normal) if normal else 0.0
        self.max_score = max([FLT_MIN, *normal])

    def isolated_chars(self) -> list[str]:
        """Characters of unreachable pieces that have no piece of their own: cut out of the text so
        that the unreachable piece cannot be matched around them."""
        return sorted({c for p in self.low if len(p) > 1 for c in p if c not in self.single})

    def problems(self) -> list[str]:
        out = []
        loose = sorted({c for p in self.reachable if len(p) > 1 for c in p if c not in self.single})
        if loose:
            out.append(f"characters {loose[:10]!r} occur in pieces but are no piece of their own")
        singles = [p for p in self.low if len(p) == 1]
        if singles:
            out.append(f"control/byte/unused pieces of one character {singles[:10]!r}")
        return out


def check(model_file: Path) -> list[str]:
    """What could make the tokenizer.json of `model_file` encode some text differently from
    sentencepiece (an empty list for every model `dataprep build` trains)."""
    proto = load_proto(model_file)
    ns, ts = proto.normalizer_spec, proto.trainer_spec
    out = _Pieces(proto).problems()
    if ts.model_type not in (1, 2):
        out.append(f"model type {ts.model_type} (only unigram 1 and BPE 2 are converted)")
    if ts.treat_whitespace_as_suffix or not ns.escape_whitespaces:
        out.append("treat_whitespace_as_suffix / escape_whitespaces=false are not reproduced")
    if ns.remove_extra_whitespaces:
        out.append("remove_extra_whitespaces is reproduced for spaces only")
    if ts.model_type == 2 and any(len(p.piece) > 1 for p in proto.pieces if p.type == USER_DEFINED):
        out.append("BPE with user-defined symbols longer than one character: they are not kept whole")
    return out


def build(model_file: Path):
    """A `tokenizers.Tokenizer` that encodes and decodes as the sentencepiece model does."""
    from tokenizers import Tokenizer

    proto = load_proto(model_file)
    pieces = _Pieces(proto)
    ts = proto.trainer_spec
    tok = Tokenizer(_unigram(proto, pieces) if ts.model_type == 1 else _bpe(proto))
    tok.normalizer = _normalizer(proto.normalizer_spec)
    isolated = pieces.isolated_chars()
    if isolated:
        from tokenizers import Regex, pre_tokenizers
        pattern = "|".join(_regex_escape(c) for c in isolated)
        tok.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    tok.decoder = _decoder(proto.normalizer_spec.add_dummy_prefix)
    return tok


def _regex_escape(c: str) -> str:
    import re
    return re.escape(c)


def _unigram(proto, pieces: _Pieces):
    from tokenizers import models

    longest = max([len(p) for p in pieces.low] or [1])
    # below any path that spells the same text with single-character pieces (each >= min_score)
    low = (longest + 1) * (pieces.min_score - 10.0) - 10.0
    vocab = []
    for piece, score, kind in pieces.pieces:
        if kind == NORMAL:
            vocab.append((piece, float(score)))
        elif kind == USER_DEFINED:   # sentencepiece's encoder: length in UTF-8 bytes x max_score - 0.1
            vocab.append((piece, _f32(len(piece.encode("utf-8")) * pieces.max_score - 0.1)))
        else:
            vocab.append((piece, low))
    unk = proto.trainer_spec.unk_id
    return models.Unigram(vocab, unk, bool(proto.trainer_spec.byte_fallback))


def _bpe(proto):
    from tokenizers import models

    vocab = {p.piece: i for i, p in enumerate(proto.pieces)}
    score = {p.piece: (p.score, i) for i, p in enumerate(proto.pieces) if p.type == NORMAL}
    mergeable = {p.piece for p in proto.pieces if p.type in (NORMAL, USER_DEFINED)}
    merges = []
    for piece, (s, i) in score.items():
        for k in range(1, len(piece)):
            left, right = piece[:k], piece[k:]
            if left in mergeable and right in mergeable:
                merges.append((-s, i, vocab[left], (left, right)))
    merges.sort()
    unk = proto.pieces[proto.trainer_spec.unk_id].piece
    return models.BPE(vocab, [m[-1] for m in merges], unk_token=unk, fuse_unk=True,
                      byte_fallback=bool(proto.trainer_spec.byte_fallback))


def _normalizer(ns):
    from tokenizers import Regex, normalizers

    steps = []
    if ns.precompiled_charsmap:
        steps.append(normalizers.Precompiled(ns.precompiled_charsmap))
    if ns.remove_extra_whitespaces:
        steps += [normalizers.Replace(Regex(" {2,}"), " "), normalizers.Replace(Regex("^ | $"), "")]
    if ns.add_dummy_prefix:
        steps.append(normalizers.Prepend(SPACE))
    steps.append(normalizers.Replace(" ", SPACE))
    return normalizers.Sequence(steps)


def _decoder(dummy_prefix: bool):
    from tokenizers import decoders

    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if dummy_prefix:
        steps.append(decoders.Strip(" ", 1, 0))
    return decoders.Sequence(steps)


# ---------------------------------------------------------------- the files

def special_tokens(model_file: Path) -> dict:
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(model_file))
    piece = lambda i: sp.id_to_piece(i) if 0 <= i < sp.get_piece_size() else None  # noqa: E731
    special = {"bos_token": piece(sp.bos_id()), "eos_token": piece(sp.eos_id()),
               "unk_token": piece(sp.unk_id()), "pad_token": piece(sp.pad_id())}
    return {k: v for k, v in special.items() if v is not None}


def write(model_file: Path, out: Path, seq_length: int) -> list[str]:
    """tokenizer.model (a copy), tokenizer.json, tokenizer_config.json, special_tokens_map.json in
    `out`. Returns check()'s problems (empty: the fast tokenizer equals sentencepiece)."""
    out = Path(out)
    shutil.copyfile(model_file, out / "tokenizer.model")
    tok = build(model_file)
    tok.save(str(out / "tokenizer.json"))
    special = special_tokens(model_file)
    added = {str(i): {"content": p.piece, "lstrip": False, "rstrip": False, "normalized": False,
                      "single_word": False, "special": True}
             for i, p in enumerate(load_proto(model_file).pieces) if p.type in (CONTROL, UNKNOWN)}
    config = {"tokenizer_class": "LlamaTokenizer",
              "add_bos_token": False, "add_eos_token": False,   # documents are packed without BOS
              "legacy": True,                  # the slow tokenizer: plain sentencepiece encode
              "add_prefix_space": None,        # anything else makes transformers re-convert tokenizer.model
              "split_special_tokens": True,    # "<s>" in text is text, as in training
              "model_max_length": seq_length, "clean_up_tokenization_spaces": False,
              "sp_model_kwargs": {}, "added_tokens_decoder": added,
              **special}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")
    return check(model_file)
