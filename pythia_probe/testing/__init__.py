"""Test helpers: a loopback Hugging Face hub (``testing.hub``: HubServer, Fault) and tiny
Pythia-like checkpoint repos (``testing.repos``: build_pythia_like_repo, tiny_config)."""
