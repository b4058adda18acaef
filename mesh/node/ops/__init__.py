"""Operations: metrics (`metrics`) and their HTTP endpoint (`metrics_http`), partition moves decided from the gossiped view (`elastic`)."""
