-- A message is written by every follow-up step, every rule that sends, every inbound message, and each
-- write paid for keys that others already cover.
--
-- Three indexes from the first schema (0001) lead with a contact, a conversation or an enrollment, for
-- lookups that now all name the project: the project-led indexes of 0019 serve them, and the foreign keys
-- that cascade from a contact or a conversation are (project_id, contact_id) and (project_id,
-- conversation_id), whose lookups those indexes serve too. A follow-up's message entered both of each pair:
-- three index entries fewer a message, each a random page of an index as large as the table's history.
DROP INDEX messages_contact_idx;
DROP INDEX messages_conversation_idx;
DROP INDEX messages_enrollment_idx;

-- A message's contact (NOT NULL, its key (project_id, contact_id)) is the project's, as an enrollment's is
-- (0032): the key to projects checked nothing more, and every insert share-locked the project's one row,
-- which every concurrent writer of the project locked too. Deleting a project still deletes its messages,
-- through its contacts (ON DELETE CASCADE all the way).
ALTER TABLE messages DROP CONSTRAINT messages_project_id_fkey;
