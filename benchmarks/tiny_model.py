"""A tiny llama-architecture GGUF model with random weights, generated in a few milliseconds.

Two layers, 64 wide, an SPM vocabulary of the ChatML control tokens, '▁', the printable
ASCII characters and all 256 byte tokens (so any text tokenizes), and the ChatML chat
template; about 0.5 MB of float32, the same bytes for the same seed.

The weights are random with one planted structure, so replies are short and end on their
own: the blocks write little into the residual stream, and the output head maps each
printable token to a successor further along a seeded random chain whose last link is
`<|im_end|>` (the EOS token). A reply is then some 20 tokens of gibberish that finishes
with `finish_reason: "stop"`, identical run to run at low temperature, rather than text
that only a token limit ends.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFWriter, TokenType

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CONTROL = ("<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>")
EOS = "<|im_end|>"

N_EMBD = 64
N_FF = 128
N_HEAD = 4
N_LAYER = 2
N_CTX_TRAIN = 4096
BLOCK_SCALE = 0.1
"""How much each block's output projection writes, relative to a random init."""
LINK_STRENGTH = 2.0
"""The normed state is about 8 * unit(embedding): a planted link scores ~16 against noise of ~1."""
MAX_STRIDE = 8
"""A chain link skips 1 to MAX_STRIDE tokens ahead: ~20 tokens from start to EOS."""


def vocabulary() -> tuple[list[str], list[TokenType]]:
    """Control tokens, then '▁' and printable ASCII (normal), then the 256 byte tokens."""
    normal = ["\u2581", *(chr(c) for c in range(0x21, 0x7F))]
    tokens = [*CONTROL, *normal, *(f"<0x{b:02X}>" for b in range(256))]
    types = [TokenType.UNKNOWN] + [TokenType.CONTROL] * (len(CONTROL) - 1)
    types += [TokenType.NORMAL] * len(normal) + [TokenType.BYTE] * 256
    return tokens, types


def write_tiny_model(path: str | Path, *, seed: int = 0, endless: bool = False) -> Path:
    """Write the model to `path` and return it; an `endless` model's chain loops instead of ending in EOS."""
    path = Path(path)
    rng = np.random.default_rng(seed)
    tokens, types = vocabulary()
    n_vocab = len(tokens)

    def weight(rows: int, cols: int, scale: float = 1.0) -> np.ndarray:
        # numpy (rows, cols) is ggml's [cols, rows]: (out_features, in_features).
        return (scale * rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    embeddings = rng.standard_normal((n_vocab, N_EMBD)).astype(np.float32)
    head = weight(n_vocab, N_EMBD)
    unit = embeddings / np.linalg.norm(embeddings, axis=1, keepdims=True)
    normal = [i for i, kind in enumerate(types) if kind == TokenType.NORMAL]
    chain = [int(i) for i in rng.permutation(normal)]
    end = chain[0] if endless else tokens.index(EOS)
    links = {tokens.index("<0x0A>"): chain[0]}  # the generation prompt ends with a newline
    for position, token in enumerate(chain):
        following = position + int(rng.integers(1, MAX_STRIDE + 1))
        links[token] = chain[following] if following < len(chain) else end
    for token, successor in links.items():
        head[successor] += LINK_STRENGTH * unit[token]

    writer = GGUFWriter(path, "llama")
    writer.add_name("responses-ws tiny random llama")
    writer.add_context_length(N_CTX_TRAIN)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYER)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD)
    writer.add_rope_dimension_count(N_EMBD // N_HEAD)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(0)  # all F32

    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * len(CONTROL) + [-float(i) for i in range(n_vocab - len(CONTROL))])
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(tokens.index(EOS))
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_chat_template(CHATML_TEMPLATE)

    ones = np.ones(N_EMBD, dtype=np.float32)
    writer.add_tensor("token_embd.weight", embeddings)
    for layer in range(N_LAYER):
        block = f"blk.{layer}"
        writer.add_tensor(f"{block}.attn_norm.weight", ones)
        writer.add_tensor(f"{block}.attn_q.weight", weight(N_EMBD, N_EMBD))
        writer.add_tensor(f"{block}.attn_k.weight", weight(N_EMBD, N_EMBD))
        writer.add_tensor(f"{block}.attn_v.weight", weight(N_EMBD, N_EMBD))
        writer.add_tensor(f"{block}.attn_output.weight", weight(N_EMBD, N_EMBD, BLOCK_SCALE))
        writer.add_tensor(f"{block}.ffn_norm.weight", ones)
        writer.add_tensor(f"{block}.ffn_gate.weight", weight(N_FF, N_EMBD))
        writer.add_tensor(f"{block}.ffn_up.weight", weight(N_FF, N_EMBD))
        writer.add_tensor(f"{block}.ffn_down.weight", weight(N_EMBD, N_FF, BLOCK_SCALE))
    writer.add_tensor("output_norm.weight", ones)
    writer.add_tensor("output.weight", head)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
