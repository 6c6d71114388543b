"""Tokenization, detokenization and BLS orchestration behind the Python-backend pipeline models."""
