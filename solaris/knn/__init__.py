"""User and item neighbours, built offline: the user encoder (``user_encoder``) and the faiss
index, tables, publishing and reading (``tables``)."""
