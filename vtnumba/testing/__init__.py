"""Test helpers shipped with vtnumba: an independent oracle (``reference``) and hypothesis
strategies (``strategies``) for users' own property tests."""
