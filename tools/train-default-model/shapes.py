"""Procedural data: 64x64 RGB pictures of one shape on a plain background, with captions.

Caption template: "a[n] [SIZE] COLOUR SHAPE[ in the POSITION] on a[n] BG background".
SIZE omitted = medium, POSITION omitted = center. Held-out combinations (HOLDOUT_SHAPE_COLOUR,
HOLDOUT_COLOUR_BG) never appear in training; the evaluation prompts are drawn from them.
"""
import json
import os
import subprocess

import numpy as np

RES = 64
COLOURS = {
    "red": (220, 30, 30),
    "green": (30, 160, 50),
    "blue": (30, 60, 220),
    "yellow": (240, 220, 30),
    "purple": (140, 40, 180),
    "orange": (245, 140, 20),
    "white": (245, 245, 245),
    "black": (20, 20, 20),
}
SHAPES = ["circle", "square", "triangle", "cross", "ring"]
SIZES = {"small": 7.0, "medium": 11.0, "large": 15.5}
POSITIONS = {  # (row, col) cell of a 3x3 grid
    "top left": (0, 0), "top": (0, 1), "top right": (0, 2),
    "left": (1, 0), "center": (1, 1), "right": (1, 2),
    "bottom left": (2, 0), "bottom": (2, 1), "bottom right": (2, 2),
}
CELL_CENTRES = (16.0, 32.0, 48.0)

# never seen together in training
HOLDOUT_SHAPE_COLOUR = {("red", "square"), ("green", "triangle"), ("blue", "ring"), ("yellow", "circle"),
                        ("purple", "cross"), ("orange", "square"), ("white", "triangle"), ("black", "circle")}
HOLDOUT_COLOUR_BG = {("red", "blue"), ("green", "white"), ("blue", "yellow"), ("yellow", "black"),
                     ("purple", "orange"), ("orange", "green"), ("white", "red"), ("black", "purple")}


def is_heldout(colour, shape, bg):
    return (colour, shape) in HOLDOUT_SHAPE_COLOUR or (colour, bg) in HOLDOUT_COLOUR_BG


def article(word):
    return "an" if word[0] in "aeiou" else "a"


def caption(a):
    """a: dict(shape, colour, bg, size or None, position or None)"""
    words = ([a["size"]] if a.get("size") else []) + [a["colour"], a["shape"]]
    s = f"{article(words[0])} {' '.join(words)}"
    if a.get("position"):
        s += " in the center" if a["position"] == "center" else f" in the {a['position']}"
    return s + f" on {article(a['bg'])} {a['bg']} background"


def shape_mask(shape, cx, cy, r, res=RES, ss=4):
    """Anti-aliased coverage in [0, 1] of the shape, rendered at ss x ss supersampling."""
    n = res * ss
    c = (np.arange(n) + 0.5) / ss
    x, y = np.meshgrid(c, c)
    dx, dy = x - cx, y - cy
    if shape == "circle":
        m = dx * dx + dy * dy <= r * r
    elif shape == "ring":
        d2 = dx * dx + dy * dy
        m = (d2 <= r * r) & (d2 >= (0.55 * r) ** 2)
    elif shape == "square":
        h = 0.85 * r
        m = (np.abs(dx) <= h) & (np.abs(dy) <= h)
    elif shape == "cross":
        t = 0.32 * r
        m = ((np.abs(dx) <= t) & (np.abs(dy) <= r)) | ((np.abs(dy) <= t) & (np.abs(dx) <= r))
    elif shape == "triangle":  # pointing up, apex at cy - r, base at cy + 0.8 r
        top, base = cy - r, cy + 0.8 * r
        frac = (y - top) / (base - top)
        m = (y >= top) & (y <= base) & (np.abs(dx) <= frac * r * 1.05)
    else:
        raise ValueError(shape)
    return m.reshape(res, ss, res, ss).mean(axis=(1, 3))


def render(a, rng=None):
    """-> uint8 [64, 64, 3]. rng: position jitter (None = exact cell centre)."""
    size = a.get("size") or "medium"
    pos = a.get("position") or "center"
    r = SIZES[size]
    row, col = POSITIONS[pos]
    cx, cy = CELL_CENTRES[col], CELL_CENTRES[row]
    if rng is not None:
        cx += rng.uniform(-2.5, 2.5)
        cy += rng.uniform(-2.5, 2.5)
        r *= rng.uniform(0.93, 1.07)
    m = shape_mask(a["shape"], cx, cy, r)[..., None]
    fg = np.array(COLOURS[a["colour"]], np.float32)
    bg = np.array(COLOURS[a["bg"]], np.float32)
    return np.clip(np.round(m * fg + (1 - m) * bg), 0, 255).astype(np.uint8)


def sample_attrs(rng, heldout=False, p_no_size=0.2, p_no_pos=0.25):
    while True:
        colour, bg = rng.choice(list(COLOURS), 2, replace=False)
        shape = SHAPES[rng.integers(len(SHAPES))]
        if is_heldout(colour, shape, bg) == heldout:
            break
    a = {"shape": shape, "colour": str(colour), "bg": str(bg)}
    a["size"] = None if rng.random() < p_no_size else list(SIZES)[rng.integers(3)]
    a["position"] = None if rng.random() < p_no_pos else list(POSITIONS)[rng.integers(9)]
    return a


# ---- tokenization through cdiffusers' own tokenizers (CLIP BPE and T5 unigram split on spaces,
# so a caption's ids are the concatenation of its words' ids; verified in check_tokens()) ----
def _cli_tokens(cli, model_dir, text, max_len):
    out = subprocess.run([cli, "tokenize", "--model", model_dir, "--prompt", text, "--max-length", str(max_len)],
                         check=True, capture_output=True, text=True).stdout
    res = {}
    for line in out.strip().splitlines():
        name, rest = line.split(":", 1)
        res[name.strip()] = [int(t) for t in rest.split(":", 1)[1].split()]
    return res


class Tokenizer:
    def __init__(self, cli, model_dir, cache_path, t5_len):
        self.t5_len = t5_len
        self.cache = json.load(open(cache_path)) if os.path.exists(cache_path) else {}
        vocab = set(["a", "an", "in", "the", "on", "background", ""])
        for w in list(COLOURS) + SHAPES + list(SIZES) + [p for k in POSITIONS for p in k.split()]:
            vocab.add(w)
        changed = False
        for w in sorted(vocab):
            if w not in self.cache:
                t = _cli_tokens(cli, model_dir, w, 77)
                self.cache[w] = {"clip": t["tokenizer"][1:-1], "t5": t["tokenizer_2"][:-1]}
                changed = True
        if changed:
            json.dump(self.cache, open(cache_path, "w"), indent=0, sort_keys=True)
        self.cli, self.model_dir = cli, model_dir

    def ids(self, text):
        """-> (clip ids [77], t5 ids [t5_len]) exactly as the pipeline's tokenizer calls give them."""
        words = text.split()
        clip = [49406] + sum((self.cache[w]["clip"] for w in words), []) + [49407]
        t5 = sum((self.cache[w]["t5"] for w in words), []) + [1]
        assert len(clip) <= 77 and len(t5) <= self.t5_len, text
        return clip + [49407] * (77 - len(clip)), t5 + [0] * (self.t5_len - len(t5))

    def check(self, texts):
        for t in texts:
            ref = _cli_tokens(self.cli, self.model_dir, t, self.t5_len)
            c, t5 = self.ids(t)
            assert ref["tokenizer"] == c[:len(ref["tokenizer"])] and all(x == 49407 for x in c[len(ref["tokenizer"]):]), t
            n = len(ref["tokenizer_2"])
            assert ref["tokenizer_2"] == t5[:n] and all(x == 0 for x in t5[n:]), (t, ref["tokenizer_2"], t5)
