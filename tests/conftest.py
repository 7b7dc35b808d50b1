"""Puts tests/ on sys.path (pytest does so for a folder holding a conftest.py), so test data modules
shared by unit and integration tests, such as edge_case_texts, can be imported from both."""
