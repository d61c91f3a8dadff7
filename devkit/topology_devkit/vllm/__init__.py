"""vLLM itself as a judge of the agent, on the real-cluster lane: the image (image.py: built with buildah from
recipe/, cached by its pins; lock.py writes the pins) and the server pod the e2e suite and the vLLM bench run
(server.py). recipe/ is the image's build context: what it holds runs inside the image, not here."""
