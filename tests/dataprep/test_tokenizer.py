"""tokenizer.model_type reads the trainer spec alone, and agrees with a full parse of the model."""
import pytest
from sentencepiece import sentencepiece_model_pb2 as pb

from mspretrain.dataprep.tokenizer.model import TokenizerError, model_type


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
