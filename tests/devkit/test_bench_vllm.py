"""bench/cluster/vllm_beside_hog.py's pure part: the hog's CPU request (the bench itself runs on the real-cluster
lane)."""

from bench.cluster.vllm_beside_hog import hog_millicores


def test_the_hog_requests_what_the_node_has_left_beside_the_server() -> None:
    assert hog_millicores("2", ["100m", "250m"]) == 2000 - 350 - 1000 - 50
    assert hog_millicores("1950m", ["0"], server="500m") == 1400


def test_the_hog_requests_at_least_100m_on_a_full_node() -> None:
    assert hog_millicores("2", ["1", "900m"]) == 100
