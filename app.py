"""trainmem serve as a Hugging Face Space: `python app.py` serves the page on 0.0.0.0:7860, the port Spaces expose.

The same app as `trainmem serve` (src/trainmem/serve/), listening on every interface because a Space's proxy
reaches it from outside the container. It estimates presets and hub configs (config.json only, never weights)
and uploaded config.json files; see docs/guide/serve.md for the Space's README header and requirements.
"""

import os

from trainmem.serve import create_app

app = create_app(processes=int(os.environ.get("TRAINMEM_SERVE_WORKERS", "2")))

if __name__ == "__main__":  # spawned worker processes import this file too: only the main one serves
    import uvicorn

    uvicorn.run(app, host="0.0.0.0", port=int(os.environ.get("PORT", "7860")), log_level="warning",
                timeout_graceful_shutdown=5)
