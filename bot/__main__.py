from bot.cli.cli import main

raise SystemExit(main())
