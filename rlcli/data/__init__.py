"""Training data: chat-log importers, redaction, and dataset validation.

importers.py  record layouts, one pure function per format (openai, anthropic, messages, langsmith)
messages.py   the normalized message shape; converting one message; finalizing a conversation
redact.py     personal data and secrets -> typed placeholders
import_cmd.py `rlcli import`: streaming I/O, feedback spooling, the summary
validate.py   check a conversations file before `train sl` reads it
"""
