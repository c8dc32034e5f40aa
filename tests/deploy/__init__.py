"""Tests of deploy/ and release/: the EC2 user data, supervisor, the release file, the requirements."""
