"""Reproductions of the paper's experiments through the product's own party A and B code."""
