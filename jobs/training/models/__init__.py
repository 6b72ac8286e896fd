"""The model: its architecture as data, the named presets, the Llama-style network, and Hugging Face weights.

  architecture  a model's shape as typed data, read from and written to a Hugging Face config.json; torch-free
  presets       named shapes (tiny ... 310B, Llama 2) and the shipped configs in ../architectures/; torch-free
  llama         the network built from an architecture, its initialization, loss and FLOP counts
  hf_weights    released Hugging Face weights loaded into the sharded model (``model.init_from``)
"""
