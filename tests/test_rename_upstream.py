"""The b12x -> b12x_next rename is upstream's, expression for expression: the same corpus through
tp4's transform and through `perl -pe` with the expressions of upstream's fetch_runtime.sh and
build_b12x_next.sh (`s/\\bb12x\\b(?!-)/b12x_next/g; s/\\bB12X_(?!NEXT_)/B12X_NEXT_/g`). Not a unit
module: the Nix unit check has no perl."""

from __future__ import annotations

import subprocess

from hypothesis import given, settings
from hypothesis import strategies as st

from tp4.image.sources import transforms

UPSTREAM = r"s/\bb12x\b(?!-)/b12x_next/g; s/\bB12X_(?!NEXT_)/B12X_NEXT_/g"

CORPUS = b"""import b12x
from b12x.comm.roce import proxy
_B12X_TIMING = os.environ.get("B12X_TIMING", "0")
VLLM_B12X_TIMING = 1
os.environ['B12X_ROCE_HCA'] or B12X_NEXT_COMPILE_CACHE_DIR
b12x-source.tar.gz b12x_kernels xb12x b12xy "b12x" b12x_next
#define B12X_MAX 4 /* MY_B12X_X */ (B12X_A)+B12X_B
torch.ops.b12x.gemm  // b12x::kernel
"""


def perl(data: bytes) -> bytes:
    return subprocess.run(["perl", "-pe", UPSTREAM], input=data, capture_output=True, check=True).stdout


def test_the_rename_of_a_corpus_is_upstreams():
    ours = transforms.rename_text(CORPUS, "b12x", "b12x_next")
    assert ours == perl(CORPUS)
    assert b"_B12X_TIMING = " in ours and b"VLLM_B12X_TIMING" in ours and b"B12X_NEXT_TIMING" in ours


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.text("abxB12X_-. \n()'\":", max_size=20),
            st.sampled_from(["b12x", "B12X_", "_B12X_", "b12x-", "b12x_next", "B12X_NEXT_", "VLLM_B12X_"]),
        ),
        max_size=16,
    )
)
def test_any_text_is_renamed_as_perl_renames_it(parts):
    text = "".join(parts).encode()
    assert transforms.rename_text(text, "b12x", "b12x_next") == perl(text)
