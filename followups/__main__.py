from followups.cli import main

raise SystemExit(main())
