# spamnb: a message taken out of Junk (or the unsure folder) into another folder is
# learned as ham (learning it as ham forgets it as spam). Into a trash folder it
# teaches nothing: deleting spam says nothing new about it; into the unsure
# folder neither; into Junk it is spam (report-spam.sieve). Run by Dovecot's IMAPSieve
# (imapsieve_mailbox2_* and imapsieve_mailbox3_*, 90-spamnb-imapsieve.conf).
require ["vnd.dovecot.pipe", "copy", "imapsieve", "environment", "variables"];
if environment :matches "imap.mailbox" "*" {
    set "mailbox" "${1}";
}
if string "${mailbox}" ["Trash", "Deleted Messages", "Deleted Items", "Bin", "Junk", "Unsure"] {
    stop;
}
pipe :copy "spamnb-learn" ["ham"];
