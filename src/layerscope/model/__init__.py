"""The one data model: the tree (``Profile``), its op table and side documents, the raw
capture records it is built from, run facts, the document schema and its codecs, checks,
transforms, diffs, merged ranks and benchmark results. No torch.
"""
