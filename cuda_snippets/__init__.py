"""Shared CUDA snippets (.cuh), installed as package data of ops and read as text by ops._codegen."""
