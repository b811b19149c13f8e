"""A third family for the tests: a linear regressor in torch on the numeric columns of a CSV."""

from tests.families.tabular import serving  # noqa: F401,E402  (registers its model card and its served family)
