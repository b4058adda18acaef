"""Links to other brokers (`peers`), the peer clock-offset estimate (`peer_clock`), leadership announcements into gossip (`publish`)."""
