# spamnb: a message put into Junk (moved, or copied: IMAPSieve calls both COPY)
# is learned as spam, into the mail user's own model. Run by Dovecot's IMAPSieve
# (imapsieve_mailbox1_*, 90-spamnb-imapsieve.conf).
require ["vnd.dovecot.pipe", "copy", "imapsieve", "environment", "variables"];
pipe :copy "spamnb-learn" ["spam"];
