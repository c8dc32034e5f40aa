"""The hot cache of documents: its entries, what may fill it, and the invalidations that keep it true."""
