"""The dataset's sentencepiece tokenizer: its training sample, vocabulary fit, training or reuse."""
