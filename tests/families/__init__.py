"""Model families the tests build through flows/family.py, as a user's own family would be."""
