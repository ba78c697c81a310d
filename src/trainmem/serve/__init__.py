"""`trainmem serve`: the library's answers as a local web page, every card at once, live as the form changes.

    trainmem serve                      # http://127.0.0.1:7860
    python app.py                       # the same app as a Hugging Face Space (0.0.0.0:7860)

`inputs.py` reads a request as the CLI reads flags, `lookup.py` looks hub ids up in threads of their own,
`answers.py` computes and caches the answers (analytic at once, simulate in `workers.py`'s processes),
`page.py` renders them, `app.py` holds the routes. Nothing here models
memory: every number is `trainmem.estimate`'s (through `search.cards`), `trainmem.make_plan`'s or
`trainmem.report`'s. See docs/guide/serve.md.
"""

from .app import create_app

__all__ = ["create_app"]
