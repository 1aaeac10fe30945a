"""Text to token ids, free of torch and TorchTitan so data preparation starts in seconds:
GPT-2's offline BPE (``bpe``), the document encoders a run may use and which one it uses
(``encoders``), and a hub id in ``model.hf_assets_path`` fetched to a local folder
(``hf_assets``). TorchTitan's tokenizer interface over them is ``components.titan_tokenizer``."""
