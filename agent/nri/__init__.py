"""A small NRI (Node Resource Interface) plugin: ttrpc over NRI's multiplexer on a Unix socket
(:mod:`agent.nri.wire`, :mod:`agent.nri.ttrpc`) and the plugin's handshake, events and reconnects
(:mod:`agent.nri.stub`). What it answers is decided elsewhere (agent/policy, through
agent/enforce/nri_hooks.py)."""
