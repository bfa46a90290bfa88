"""The lobby service's pure core (issue 18): registry, tickets, protocol, replica, home choice.

The networked service (sessions, logical channels, topics) is built on these modules; none of
them imports trio or reads a clock.
"""
