import pytest

from tests.tiny_checkpoints import build


@pytest.fixture(scope="session")
def tiny_dense(tmp_path_factory):
    return build(tmp_path_factory.mktemp("tiny_dense"), moe=False)


@pytest.fixture(scope="session")
def tiny_moe(tmp_path_factory):
    return build(tmp_path_factory.mktemp("tiny_moe"), moe=True)
