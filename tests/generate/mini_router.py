"""A tiny stand-in for sglang-router (spec §6), run as its own process by the tests.

It proxies /generate (streams passed through as they come), /health, /model_info and /server_info
to one worker, forwards only the sampling keys the real router forwards (so
`spaces_between_special_tokens` and `stream_interval` are dropped), and injects the router's own
refusals: `--no-workers N` (503 text/plain "No available workers ..."), `--queue-full N` (429),
`--queue-timeout N` (408), in that order, on the first /generate calls.

Like sglang-router: `/health` and `/liveness` always 200, `/readiness` 200 only with a worker,
`/workers` lists them. `--start-empty` starts with no worker (every /generate answers 503 "No
available workers"); POST /_router/workers {"urls": [...]} sets the list (test control).
"""

from __future__ import annotations

import argparse
import json

import aiohttp
from aiohttp import web

FORWARDED = {
    "temperature",
    "max_new_tokens",
    "top_p",
    "top_k",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "stop",
    "ignore_eos",
    "skip_special_tokens",
    "json_schema",
    "regex",
    "ebnf",
    "min_p",
    "min_new_tokens",
    "stop_token_ids",
    "no_stop_trim",
    "n",
    "sampling_seed",
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--worker", required=True)
    ap.add_argument("--no-workers", type=int, default=0)
    ap.add_argument("--queue-full", type=int, default=0)
    ap.add_argument("--queue-timeout", type=int, default=0)
    ap.add_argument("--start-empty", action="store_true")
    args = ap.parse_args()
    workers: list[str] = [] if args.start_empty else [args.worker]
    plan = ["503"] * args.no_workers + ["429"] * args.queue_full + ["408"] * args.queue_timeout
    stats = {"generate": 0, "forwarded": 0, "dropped_keys": 0}

    async def generate(request: web.Request) -> web.StreamResponse:
        stats["generate"] += 1
        if not workers:
            stats["no_workers"] = stats.get("no_workers", 0) + 1
            return web.Response(status=503, text="No available workers (all circuits open or unhealthy)")
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
        async with request.app["session"].post(workers[0] + "/generate", json=body) as r:
            if r.content_type != "text/event-stream":
                return web.Response(status=r.status, body=await r.read(), content_type=r.content_type)
            out = web.StreamResponse(status=r.status, headers={"Content-Type": "text/event-stream"})
            await out.prepare(request)
            async for chunk in r.content.iter_any():
                await out.write(chunk)
            return out

    async def readiness(request: web.Request) -> web.Response:
        return web.Response(status=200 if workers else 503)

    async def list_workers(request: web.Request) -> web.Response:
        return web.json_response(
            {
                "workers": [
                    {"id": f"w{i}", "url": u, "model_id": "unknown", "is_healthy": True, "worker_type": "regular"}
                    for i, u in enumerate(workers)
                ],
                "total": len(workers),
            }
        )

    async def set_workers(request: web.Request) -> web.Response:
        workers[:] = list((await request.json()).get("urls") or [])
        return web.json_response({"urls": workers})

    async def proxy_get(request: web.Request) -> web.Response:
        # proxied to the first worker, as sglang-router does (with none, the configured one)
        async with request.app["session"].get((workers or [args.worker])[0] + request.path) as r:
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
    app.router.add_get("/health", lambda r: web.Response(status=200))  # liveness only, as sglang-router
    app.router.add_get("/readiness", readiness)
    app.router.add_get("/workers", list_workers)
    app.router.add_post("/_router/workers", set_workers)
    for p in ("/model_info", "/get_model_info", "/server_info", "/get_server_info"):
        app.router.add_get(p, proxy_get)
    app.router.add_get("/_router/stats", get_stats)
    web.run_app(app, host="127.0.0.1", port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
