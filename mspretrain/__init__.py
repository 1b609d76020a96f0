"""mspretrain: dataprep (build datasets), loader (read them), train (the MindSpore trainer), common."""
