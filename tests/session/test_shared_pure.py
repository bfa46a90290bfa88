"""Unit tests written to kill surviving mutants (./dev mutate); see README, Mutation testing."""
