"""The per-document steps: normalisation, quality filters, language, PII, decontamination, the classifier."""
