"""A tiny stand-in for sglang-router (spec §6), run as its own process by the tests.

It proxies /generate, /health, /model_info and /server_info to one worker, forwards only the
sampling keys the real router forwards (so `spaces_between_special_tokens` is dropped), and
injects the router's own refusals: `--no-workers N` (503 text/plain "No available workers ..."),
`--queue-full N` (429), `--queue-timeout N` (408), in that order, on the first /generate calls.
"""

from __future__ import annotations

import argparse
import json

import aiohttp
from aiohttp import web

FORWARDED = {"temperature", "max_new_tokens", "top_p", "top_k", "frequency_penalty", "presence_penalty",
             "repetition_penalty", "stop", "ignore_eos", "skip_special_tokens", "json_schema", "regex", "ebnf",
             "min_p", "min_new_tokens", "stop_token_ids", "no_stop_trim", "n", "sampling_seed"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--worker", required=True)
    ap.add_argument("--no-workers", type=int, default=0)
    ap.add_argument("--queue-full", type=int, default=0)
    ap.add_argument("--queue-timeout", type=int, default=0)
    args = ap.parse_args()
    plan = ["503"] * args.no_workers + ["429"] * args.queue_full + ["408"] * args.queue_timeout
    stats = {"generate": 0, "forwarded": 0, "dropped_keys": 0}

    async def generate(request: web.Request) -> web.Response:
        stats["generate"] += 1
        if plan:
            code = plan.pop(0)
            if code == "503":
                return web.Response(status=503, text="No available workers (all circuits open or unhealthy)")
            if code == "429":
                return web.Response(status=429, text="Too Many Requests")
            return web.Response(status=408, text="Request Timeout")
        body = json.loads(await request.read())
        if not isinstance(body.get("rid", ""), str) or not isinstance(body.get("sampling_params", {}), dict):
            return web.Response(status=400, text="Failed to deserialize the JSON body")
        sp = body.get("sampling_params", {})
        kept = {k: v for k, v in sp.items() if k in FORWARDED}
        stats["dropped_keys"] += len(sp) - len(kept)
        body["sampling_params"] = kept
        stats["forwarded"] += 1
        async with request.app["session"].post(args.worker + "/generate", json=body) as r:
            return web.Response(status=r.status, body=await r.read(), content_type=r.content_type)

    async def proxy_get(request: web.Request) -> web.Response:
        async with request.app["session"].get(args.worker + request.path) as r:
            return web.Response(status=r.status, body=await r.read(), content_type=r.content_type)

    async def get_stats(request: web.Request) -> web.Response:
        return web.json_response(stats)

    async def on_startup(app: web.Application) -> None:
        app["session"] = aiohttp.ClientSession()

    async def on_cleanup(app: web.Application) -> None:
        await app["session"].close()

    app = web.Application()
    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    app.router.add_post("/generate", generate)
    app.router.add_get("/liveness", lambda r: web.Response(status=200))
    for p in ("/model_info", "/get_model_info", "/server_info", "/get_server_info", "/health"):
        app.router.add_get(p, proxy_get)
    app.router.add_get("/_router/stats", get_stats)
    web.run_app(app, host="127.0.0.1", port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
