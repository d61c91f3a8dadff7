"""Token-bucket rate limiting of the pod-resources server (`podresources/grpc/ratelimit.go`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import grpc

RATE_LIMIT_MESSAGE = "rejected by rate limit"


class TokenBucket:
    """`golang.org/x/time/rate.Limiter` semantics for `Allow()`: starts full, refills at `rate`/s."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        if rate <= 0 or burst <= 0:
            raise ValueError("rate and burst must be positive")
        self.rate = float(rate)
        self.burst = int(burst)
        self._clock = clock
        self._tokens = float(burst)
        self._last = clock()
        self._lock = threading.Lock()

    def allow(self) -> bool:
        with self._lock:
            now = self._clock()
            self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.rate)
            self._last = now
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                return True
            return False


class RateLimitInterceptor(grpc.ServerInterceptor):
    """Rejects unary calls with RESOURCE_EXHAUSTED "rejected by rate limit" when the bucket is empty."""

    def __init__(self, bucket: TokenBucket, on_reject: Callable[[str], None] | None = None) -> None:
        self._bucket = bucket
        self._on_reject = on_reject

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        if self._bucket.allow():
            return continuation(handler_call_details)
        method = handler_call_details.method
        if self._on_reject is not None:
            self._on_reject(method)

        def reject(_request: Any, context: grpc.ServicerContext) -> Any:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, RATE_LIMIT_MESSAGE)

        return grpc.unary_unary_rpc_method_handler(reject)
