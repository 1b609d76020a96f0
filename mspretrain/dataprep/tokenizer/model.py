"""The dataset's sentencepiece tokenizer: trained on a deterministic sample of the cleaned, deduplicated
train documents, or reused from a given `.model`.

Training choices (all fixed so the same sample gives the same model bytes):
- the sample: train documents whose hash(doc_id) falls under sample_bytes / (train bytes), in input
  order, one sentencepiece "sentence" per non-empty line; `shuffle_input_sentence=False`,
  `input_sentence_size=0` (use every line); `num_threads` from the config, never from --workers
  (sentencepiece gives a different model with a different thread count);
- normalisation `identity` and `remove_extra_whitespaces=False`: text is already NFKC-cleaned, and this
  keeps decode(encode(text)) == text; "\n" is a user-defined piece so line breaks survive;
- special ids: unk 0, bos 1, eos 2, pad 3 (a real id; packing never pads, the trainer may);
- unigram scores rounded to multiples of 2^-SCORE_BITS (`_round_scores`), so that the fast tokenizer
  of an export (exact sums) and sentencepiece (float32 sums) pick the same paths.
A reused model keeps its own ids; pad falls back to eos when the model has no pad piece.
"""
from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path

from mspretrain.common.errors import MspretrainError
from mspretrain.loader.manifest import TokenizerInfo, sha256_file
from mspretrain.common.files import atomic_open, file_identity, publish


class TokenizerError(MspretrainError, RuntimeError):
    pass


def train_tokenizer(sample_file: Path, model_path: Path, cfg, score_bits: int | None = None) -> None:
    """Train on `sample_file` (one sentence a line) and write `model_path` atomically. Unigram scores
    are rounded to multiples of 2^-score_bits (default SCORE_BITS; -1: kept as sentencepiece wrote
    them, as in models trained elsewhere)."""
    import sentencepiece as spm
    prefix = model_path.with_name(f".{model_path.stem}.tmp{os.getpid()}")
    try:
        spm.SentencePieceTrainer.train(
            input=str(sample_file), model_prefix=str(prefix), vocab_size=cfg.vocab_size,
            model_type=cfg.model_type, character_coverage=cfg.character_coverage,
            byte_fallback=cfg.byte_fallback, num_threads=cfg.num_threads,
            shuffle_input_sentence=False, input_sentence_size=0,
            max_sentence_length=cfg.max_sentence_length, normalization_rule_name="identity",
            remove_extra_whitespaces=False, user_defined_symbols=["\n"], split_digits=True,
            unk_id=0, bos_id=1, eos_id=2, pad_id=3, minloglevel=2)
    except RuntimeError as e:
        raise TokenizerError(f"sentencepiece training failed (tokenizer.vocab_size="
                             f"{cfg.vocab_size}): {str(e).splitlines()[-1]}") from None
    _finish(Path(f"{prefix}.model"), SCORE_BITS if score_bits is None else score_bits)
    publish(f"{prefix}.model", model_path)
    Path(f"{prefix}.vocab").unlink(missing_ok=True)


# Unigram scores are rounded to multiples of 2^-SCORE_BITS: sentencepiece adds path scores in float32,
# the fast tokenizer of an export exactly, and on that grid float32 sums are exact while
# |sum| < 2^(24 - SCORE_BITS), so both pick the same path, ties included. One search covers a whole
# document (plan/chunks.py tokenize_chunk), and its score grows by 2.8 per byte (demo corpus; 8.5 in its worst
# document): 3 bits keep documents of ~700 KB exact (>= 240 KB), 6 bits only ~90 KB. The cost: a
# piece's probability moves by <= e^(1/16) - 1 = 6 %; on the demo corpus 3 bits cut 1 % of documents
# otherwise (near-ties flipped, no token count changes), as 4 bits do; 2 bits twice as many.
SCORE_BITS = 3


def _finish(model: Path, score_bits: int) -> None:
    """Rewrite the trained model: paths stripped, unigram scores rounded."""
    from sentencepiece import sentencepiece_model_pb2 as pb
    proto = pb.ModelProto()
    proto.ParseFromString(model.read_bytes())
    _strip_paths(proto)
    if proto.trainer_spec.model_type == pb.TrainerSpec.UNIGRAM and score_bits >= 0:
        _round_scores(proto, score_bits)
    model.write_bytes(proto.SerializeToString(deterministic=True))


def _strip_paths(proto) -> None:
    """The trainer spec records the input and output paths; make them fixed names, so the model's
    bytes depend on what it learned and not on where the build ran."""
    del proto.trainer_spec.input[:]
    proto.trainer_spec.input.append("tokenizer_sample.txt")
    proto.trainer_spec.model_prefix = "tokenizer"


def _round_scores(proto, bits: int) -> None:
    """Normal pieces' scores to the nearest multiple of 2^-bits. The others keep theirs (0), already on
    the grid: sentencepiece never puts control or byte pieces in the lattice (an unknown character costs
    min normal score - 10, on the grid too), and a user-defined piece adds 0 to a path (measured with
    sentencepiece 0.2's n-best path scores)."""
    normal, scale = type(proto.pieces[0]).NORMAL, float(1 << bits)
    for piece in proto.pieces:
        if piece.type == normal:
            piece.score = round(piece.score * scale) / scale


def copy_tokenizer(src: str, model_path: Path) -> None:
    with atomic_open(model_path) as f, open(src, "rb") as f_src:
        shutil.copyfileobj(f_src, f)
    tokenizer_info(model_path)   # fails early on a file that is not a usable model


def tokenizer_info(model_path: Path, file: str = "tokenizer.model") -> TokenizerInfo:
    """The manifest's description of the model at `model_path` (a build asks up to three times:
    computed once per file, by its identity)."""
    try:
        identity = file_identity(model_path)
    except OSError as e:
        raise TokenizerError(f"{model_path}: cannot read the tokenizer model ({e})") from None
    return _tokenizer_info(str(model_path), file, identity)


@functools.lru_cache(maxsize=4)
def _tokenizer_info(model_path: str, file: str, identity: tuple) -> TokenizerInfo:
    import sentencepiece as spm
    try:
        sp = spm.SentencePieceProcessor(model_file=str(model_path))
    except (RuntimeError, OSError) as e:
        raise TokenizerError(f"{model_path}: not a sentencepiece model ({e})") from None
    if sp.eos_id() < 0:
        raise TokenizerError(f"{model_path}: the model defines no EOS piece; packing needs one")
    pad = sp.pad_id() if sp.pad_id() >= 0 else sp.eos_id()
    return TokenizerInfo(file=file, sha256=sha256_file(model_path), type=model_type(model_path),
                         vocab_size=sp.get_piece_size(), bos_id=sp.bos_id(), eos_id=sp.eos_id(),
                         pad_id=pad, unk_id=sp.unk_id())


def model_type(model_path: Path) -> str:
    """unigram | bpe | word | char, read from the model's trainer spec.

    Only the trainer spec (field 2 of ModelProto) is parsed: with the pure-Python protobuf runtime
    (what MindSpore selects) the pieces of a 16k vocabulary take 0.15 s, and they are not needed."""
    from sentencepiece import sentencepiece_model_pb2 as pb
    spec = pb.TrainerSpec()
    spec.ParseFromString(_message_field(Path(model_path).read_bytes(), 2))
    return pb.TrainerSpec.ModelType.Name(spec.model_type).lower()


def _message_field(data: bytes, number: int) -> bytes:
    """Every occurrence of length-delimited field `number` of a serialised protobuf message,
    concatenated (which protobuf parses as their merge)."""
    out, pos = [], 0
    while pos < len(data):
        tag, pos = _varint(data, pos)
        wire = tag & 7
        if wire == 0:
            _, pos = _varint(data, pos)
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        elif wire == 2:
            size, pos = _varint(data, pos)
            if pos + size > len(data):
                raise TokenizerError("not a sentencepiece model (protobuf cut short)")
            if tag >> 3 == number:
                out.append(data[pos:pos + size])
            pos += size
        else:
            raise TokenizerError(f"not a sentencepiece model (protobuf wire type {wire})")
    return b"".join(out)


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data):
            raise TokenizerError("not a sentencepiece model (protobuf cut short)")
        value |= (data[pos] & 0x7F) << shift
        pos, shift = pos + 1, shift + 7
        if data[pos - 1] < 0x80:
            return value, pos
