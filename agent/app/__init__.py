"""Wiring only: the settings, the composition root (:mod:`agent.app.build`, :mod:`agent.app.build_dra`), the agent
object it makes and the hand-over at its stop. No thread of its own: the workers it starts live in the rooms below."""
