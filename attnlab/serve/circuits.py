"""Attribution graphs in the explorer. `attnlab serve RUN --transcoders DIR` attaches the transcoders
that `attnlab circuits` trained (DIR/transcoders.json names the run they were trained on) to that
served run; POST /api/circuit traces the graph of a text's next token and answers the graph's page
(interpret/circuits_page.py, with the features' top contexts), which the explorer shows in a frame."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fastapi import FastAPI
from pydantic import Field

from attnlab.errors import AttnlabError
from attnlab.interpret.circuits import check_transcoders
from attnlab.interpret.circuits_page import circuit_page, feature_notes
from attnlab.interpret.circuits_run import trace_circuit
from attnlab.interpret.transcoder import load_transcoders
from attnlab.serve.requests import TextRequest
from attnlab.serve.served import Served


class CircuitRequest(TextRequest):  # text: the prompt whose next token is explained
    target: str | None = Field(None, max_length=64, description="the next token to explain (default: the top one)")


def attach_transcoders(served: dict[str, Served], folders: list[str | Path]) -> None:
    """Each folder's transcoders on the served run they were trained on; one line when that run is not
    served or they do not fit it."""
    by_path = {s.run.path.resolve(): s for s in served.values()}
    for folder in folders:
        tcs, info = load_transcoders(folder)
        trained_on = Path(info["run"]).resolve() if info.get("run") else None
        s = by_path.get(trained_on)
        if s is None:
            raise AttnlabError(
                f"--transcoders {folder} were trained on {trained_on or 'a run it does not name'}, "
                "which is not among the runs served: serve that run too"
            )
        check_transcoders(s.run.model, tcs)
        s.transcoders = [tc.to(next(s.run.model.parameters()).device) for tc in tcs]


def add_circuit_route(app: FastAPI, find: Callable[..., Served]) -> None:
    @app.post("/api/circuit", summary="the attribution graph of a text's next token, as a page (needs --transcoders)")
    def circuit(req: CircuitRequest) -> dict:
        s = find(req.run)
        if not s.transcoders:
            raise AttnlabError(
                f"{req.run} has no transcoders: start attnlab serve with --transcoders DIR (attnlab "
                "circuits RUN --prompt TEXT --out OUT trains them in OUT/transcoders)"
            )
        c = trace_circuit(s.run, req.text, req.target, s.transcoders)
        title = f"attribution graph: {s.name}, target {c.data['target']!r}"
        page = circuit_page(c.data, title, feature_notes(s.run, c.data, s.transcoders))
        return {
            "page": page,
            "target": c.data["target"],
            "scores": c.data["scores"],
            "intervention": {k: c.data["intervention"][k] for k in ("replacement_right", "real_right")},
            "seconds": c.data["seconds"],
        }
