"""The explorer's page (`attnlab serve`): one self-contained HTML document, script and style inline,
assembled from the files in serve/static/ and viz/static/.

It lists the runs from /api/runs; shows the chosen run's settings and draws its loss curve (an
inline SVG) from /api/runs/{name}/metrics; runs its task on typed text or an uploaded image
(streaming a GPT's text as it is sampled); and shows the attention of the text with the head view
and the model view of the exported page (viz/html.py), fed live from /api/attention; with "attention
while it writes", each generated token shaded by where the model looked to write it; and "Inside the
model": the logit lens, head detectors, head ablation and rollout of /api/inspect.

Ids a test or a reader can rely on, besides the views' own (see viz/html.py):
  #run (select), #run-summary, #curve (svg), #config, #prompt (textarea), #max-tokens, #temperature,
  #top-k, #top-p, #seed, #image (file input), #go, #status, #output (.generated holds a GPT's text),
  #attention-go, #attention-status, #attention-views, #live (checkbox: attention while it writes),
  #live-view, #live-layer, #live-tokens (.live-token[data-index], .generated, .newest), #inside-what,
  #inside-go, #inside-status, #inside-output (.inside-table, canvas.rollout-map, iframe.circuit-frame: an
  attribution graph's page, serve/circuits.py); a caption run's answer
  is viz/static/caption.js's view in #output .caption-view (.cap-word[data-index], canvas.cap-picture)
"""

from __future__ import annotations

from attnlab.viz.html import fill, static_text


def page(max_chars: int, max_tokens: int) -> str:
    """The page's HTML (serve/static/explorer.*, with the views of viz/static/), with the server's
    limits on the inputs."""
    serve = "attnlab.serve"
    parts = {
        "STYLE": static_text("views.css") + static_text("caption.css") + static_text("explorer.css", serve),
        "VIEWS": static_text("views.html"),
        "SCRIPT": static_text("views.js") + static_text("caption.js") + static_text("explorer.js", serve),
        "MAX_CHARS": str(max_chars),
        "MAX_TOKENS": str(max_tokens),
    }
    return fill(static_text("explorer.html", "attnlab.serve"), parts)
