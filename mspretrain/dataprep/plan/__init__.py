"""The build's one stage plan: tasks over parquet files in the work dir, run by either executor
(executor/local.py: worker processes on this machine; executor/ray.py: a Ray cluster).

The work dir (DIR/.build; for Ray on a filesystem every node shares) holds every intermediate, so
the order in which tasks finish never matters and a rerun resumes from the completed task outputs.
The stages, and the task stages they run as (run.py submits them):

  plan        the sorted inputs, one work unit per input file (independent of the executor)
  1 docs      per unit: read, clean, filter, exact key, MinHash (chunks.clean_chunk, chunk by
              chunk), and the map side of three shuffles: doc ids, exact keys, LSH cells
  2 dedup:
    ids/exact/cells   per partition: duplicate doc ids; exact-key groups; LSH buckets -> edges
    components  one union-find task over the edges: every document that shares a bucket or an exact
              key with another gets the smallest order key of its component as label
    groups    per unit: the labelled documents (with their signatures), shuffled by label
    replay    per partition: the keep rule (dedup/keep.py DedupPass) over the partition's groups in
              input order; components never interact, so each decision equals the one a single
              pass over the whole corpus in input order would make (dedup.py says why)
    settle    per unit: keep mask and counts; duplicates.parquet in input order
  3 tokenizer   sample per unit, concatenated in unit order, trained
  4 tokenize    per unit (chunks.tokenize_chunk, chunk by chunk)
  5 write       global sample ids from prefix sums of per-chunk token counts; one task per shard over
              a fixed sample range; one provenance task per split
  6 finish      in the main process (build._finish): manifest, report, publish

A document's order key is (unit << 40) | its row in the unit: input order, known without a pass
over earlier units.
"""
