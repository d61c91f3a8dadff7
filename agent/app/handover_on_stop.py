"""The running agent's part of a hand-over to the other mode (:mod:`agent.node.resource_withdrawal`): before an agent
that is the last of its mode on its node stops, the scheduler is made to stop sending it pods (device-plugin mode:
its resources' allocatable taken to zero; DRA mode: its ResourceSlices deleted), while it still serves, for ``drain``
seconds, those already on their way.

Must hold: it is the last only when its DaemonSet is being deleted or its pod template now runs the other mode
(:func:`agent.policy.teardown.handing_over`); a restart or a rolling update in the same mode, and any doubt, hands
nothing over. Design: docs/contributing/design/mode-handover.md."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from agent.app.agent import Agent
from agent.dra.driver import DraManager
from agent.node.kubeapi import NodeStatusApi
from agent.node.resource_withdrawal import DRAIN, REQUEST_TIMEOUT, withdraw_device_plugin
from agent.policy.teardown import handing_over

log = logging.getLogger("topology-agent.handover")


class HandoverApi(NodeStatusApi, Protocol):
    def get_daemonset(self, namespace: str, name: str, timeout: float) -> dict[str, Any] | None: ...


def hand_over_if_last(agent: Agent, api: Callable[[], HandoverApi], *, namespace: str, daemonset: str,
                      drain: float = DRAIN, sleep: Callable[[float], None] = time.sleep) -> str | None:
    """Before ``agent`` stops: hand its resources over when it is the last of its mode on its node; why it was the
    last (None: a restart, nothing handed over, or any doubt). Never raises."""
    config = agent.config
    try:
        client = api()
        why = handing_over(client.get_daemonset(namespace, daemonset, REQUEST_TIMEOUT), config.mode)
    except Exception as exc:  # any doubt: a restart, as the state files are kept
        log.warning("cannot tell whether this agent is the last of %s mode on its node (DaemonSet %s/%s: %s): "
                    "stopping as for a restart", config.mode, namespace, daemonset, exc)
        return None
    if why is None or not agent.devices.tables or not config.node_name:
        return None
    log.info("the last agent of %s mode on node %s (%s): handing its resources over before stopping", config.mode,
             config.node_name, why)
    if isinstance(agent.manager, DraManager):  # DRA mode
        try:
            agent.manager.withdraw_slices()
        except Exception as exc:
            log.warning("cannot delete the ResourceSlices of node %s now (the kubelet deletes them after its grace "
                        "period for a deregistered plugin): %s", config.node_name, exc)
        sleep(drain)  # still serving: prepares for claims allocated just before the slices went
    else:
        withdraw_device_plugin(client, config.node_name, agent.grouping.resources(), why=why, drain=drain,
                               sleep=sleep)
    return why
