"""Schemathesis hooks: teach it the contract's named string formats.

The document marks cron expressions `format: cron` (proto/taskmesh/options/v1/options.proto);
a JSON Schema cannot spell out which expressions ever fire, so a client that
generates data needs a source of valid ones, as any client would. Loaded with
SCHEMATHESIS_HOOKS by scripts/schemathesis.sh.
"""

import schemathesis
from hypothesis import strategies as st

CRON_EXPRESSIONS = [
    "* * * * *",
    "*/5 * * * *",
    "0 0 * * *",
    "0 9 * * 1-5",
    "30 2 1 * *",
    "15 10 * * 0,6",
    "0 */2 * * * *",
    "0 0 12 1 1 *",
]

schemathesis.openapi.format("cron", st.sampled_from(CRON_EXPRESSIONS))
