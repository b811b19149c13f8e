"""The families this service knows: importing a family's package registers it (serving.family.register_family).
A new family is its package here and one line below."""

from serving.families import molecule, sensor  # noqa: F401
