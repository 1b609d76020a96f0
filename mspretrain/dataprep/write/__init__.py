"""Packing documents into samples and writing MindRecord shards and parquet files."""
