"""Serving engines specsim drives as real processes (llama.cpp's ``llama-server``), no torch."""
