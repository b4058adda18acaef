"""The telnet text protocol (Project Kafkaesque's PUBS / SUBS / CONS).

``protocol`` parses lines and formats replies without I/O; ``text`` serves them over TCP
with the ordinary client library.
"""
