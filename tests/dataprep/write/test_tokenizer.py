"""tokenizer.model_type reads the trainer spec alone, and agrees with a full parse of the model; trained
unigram models have their normal pieces' scores on the 2^-SCORE_BITS grid (float32-exact path sums)."""
import random

import pytest
from sentencepiece import sentencepiece_model_pb2 as pb

from mspretrain.dataprep.config import TokenizerConfig
from mspretrain.dataprep.tokenizer.model import SCORE_BITS, TokenizerError, model_type, train_tokenizer


@pytest.mark.parametrize("kind", ["UNIGRAM", "BPE", "WORD", "CHAR"])
def test_model_type_agrees_with_a_full_parse(tmp_path, kind):
    proto = pb.ModelProto()
    for i in range(300):   # pieces before and after the spec, as in a real model file
        proto.pieces.add(piece=f"\u2581w{i}", score=-float(i), type=pb.ModelProto.SentencePiece.NORMAL)
    proto.trainer_spec.model_type = pb.TrainerSpec.ModelType.Value(kind)
    proto.trainer_spec.vocab_size = 300
    proto.normalizer_spec.name = "nmt_nfkc"
    path = tmp_path / "m.model"
    path.write_bytes(proto.SerializeToString())
    full = pb.ModelProto()
    full.ParseFromString(path.read_bytes())
    assert model_type(path) == pb.TrainerSpec.ModelType.Name(full.trainer_spec.model_type).lower()
    assert model_type(path) == kind.lower()


def test_model_type_of_a_cut_file_is_an_error(tmp_path):
    proto = pb.ModelProto()
    proto.trainer_spec.model_type = pb.TrainerSpec.BPE
    path = tmp_path / "cut.model"
    path.write_bytes(proto.SerializeToString()[:-1])
    with pytest.raises(TokenizerError, match="cut short"):
        model_type(path)


def test_trained_unigram_scores_are_on_the_grid_and_nothing_else_moves(tmp_path):
    """The same training, rounded and not: the same pieces and types, normal pieces' scores rounded to
    the nearest multiple of 2^-SCORE_BITS, control, user-defined and byte pieces as sentencepiece wrote
    them; the rounded model still encodes (a valid model). BPE models are not touched."""
    import sentencepiece as spm
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghij") for _ in range(rng.randint(1, 8))) for _ in range(300)]
    sample = tmp_path / "sample.txt"
    sample.write_text("\n".join(" ".join(rng.choices(words, k=12)) for _ in range(2000)), encoding="utf-8")
    cfg = TokenizerConfig(vocab_size=400, num_threads=1)

    def pieces(name, **kw):
        train_tokenizer(sample, tmp_path / name, cfg, **kw)
        proto = pb.ModelProto()
        proto.ParseFromString((tmp_path / name).read_bytes())
        return proto.pieces
    ours, theirs = pieces("ours.model"), pieces("theirs.model", score_bits=-1)
    assert [(p.piece, p.type) for p in ours] == [(p.piece, p.type) for p in theirs]
    step, normal = 2.0 ** -SCORE_BITS, pb.ModelProto.SentencePiece.NORMAL
    moved = 0
    for a, b in zip(ours, theirs):
        assert a.score == (round(b.score / step) * step if a.type == normal else b.score), a.piece
        moved += a.score != b.score
    assert moved > 0.5 * sum(p.type == normal for p in ours)
    assert {p.type for p in ours} >= {normal, pb.ModelProto.SentencePiece.CONTROL,
                                      pb.ModelProto.SentencePiece.USER_DEFINED, pb.ModelProto.SentencePiece.BYTE}
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "ours.model"))
    assert sp.decode(sp.encode(" ".join(words[:20]))) == " ".join(words[:20])

    bpe = TokenizerConfig(vocab_size=400, num_threads=1, model_type="bpe")
    train_tokenizer(sample, tmp_path / "a.model", bpe)
    train_tokenizer(sample, tmp_path / "b.model", bpe, score_bits=-1)
    assert (tmp_path / "a.model").read_bytes() == (tmp_path / "b.model").read_bytes()
