"""Test helpers: a loopback Hugging Face hub serving model and dataset repos (``testing.hub``:
HubServer, Fault; ``testing.store``: the on-disk layout), tiny Pythia-like checkpoint repos and
OpenWebText-like parquet dataset repos (``testing.repos``: build_pythia_like_repo,
build_dataset_repo, tiny_config), and ``testing.endpoint.use_endpoint`` (point huggingface_hub and
datasets at a hub inside a running process)."""
